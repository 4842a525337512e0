# Grading: retrieval metrics, attributed mass, within-cell correlations. (Filled in by the
# analysis work.)
