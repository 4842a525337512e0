# Grading: retrieval metrics (AP, Recall@10), attributed mass and the within-cell correlations
# of every method in `methods.enabled` and `methods.plugins`, from the score artifacts and the
# causal answer key. One CLI call; the tables land in {R}/analysis/ (see results/README.md).


rule analysis:
    input:
        causal=f"{R}/causal/meta.json",
        scores=all_scores(),
    output:
        meta=f"{R}/analysis/meta.json",
        retrieval=report(
            f"{R}/analysis/retrieval.csv",
            caption="../report/retrieval.rst",
            category="Analysis",
            labels={"table": "retrieval"},
        ),
        correlations=report(
            f"{R}/analysis/correlations.csv",
            caption="../report/correlations.rst",
            category="Analysis",
            labels={"table": "correlations"},
        ),
        learned=report(
            f"{R}/analysis/learned_grid.csv",
            caption="../report/learned_grid.rst",
            category="Analysis",
            labels={"table": "learned grid"},
        ),
        haystack=report(
            f"{R}/analysis/haystack.csv",
            caption="../report/haystack.rst",
            category="Analysis",
            labels={"table": "haystack"},
        ),
        per_fact=f"{R}/analysis/per_fact.parquet",
        per_query=f"{R}/analysis/per_query.parquet",
    log:
        log_of("analysis"),
    benchmark:
        bench_of("analysis")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=4000,
        runtime=15,
    params:
        sections=sections("analysis"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} analysis -c {resources.run_config:q} 2> {log:q}"
