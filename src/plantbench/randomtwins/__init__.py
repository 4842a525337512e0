"""Random twins: more twins from the shared prefix, each reading a seeded half of the fact pairs,
so each fact's causal effect gets an error bar and every method a linear datamodeling score."""
