# Grading: retrieval metrics (AP, Recall@10), attributed mass and the within-cell correlations
# of every method in `methods.enabled` and `methods.plugins`, from the score artifacts and the
# causal answer key. One CLI call; the tables land in the analysis folder (see results/README.md).
# With config `replicates` > 1, also the summary over replicates (rule replicates below).


rule analysis:
    input:
        causal=artifact("causal"),
        scores=all_scores(),
        sections=config_input("analysis"),
    output:
        meta=artifact("analysis"),
        retrieval=report(
            artifact("analysis", "retrieval.csv"),
            caption="../report/retrieval.rst",
            category="Analysis",
            labels={"table": "retrieval"},
        ),
        correlations=report(
            artifact("analysis", "correlations.csv"),
            caption="../report/correlations.rst",
            category="Analysis",
            labels={"table": "correlations"},
        ),
        learned=report(
            artifact("analysis", "learned_grid.csv"),
            caption="../report/learned_grid.rst",
            category="Analysis",
            labels={"table": "learned grid"},
        ),
        haystack=report(
            artifact("analysis", "haystack.csv"),
            caption="../report/haystack.rst",
            category="Analysis",
            labels={"table": "haystack"},
        ),
        per_fact=artifact("analysis", "per_fact.parquet"),
        per_query=artifact("analysis", "per_query.parquet"),
    log:
        rlog_of("analysis"),
    benchmark:
        rbench_of("analysis")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("analysis+report", 4000),
        runtime=15,
    params:
        replicate=replicate_of,
        sections=sections("analysis"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} analysis -c {resources.run_config:q} --replicate {params.replicate} 2> {log:q}"


# The analysis over replicates (config `replicates` > 1): every headline number as the mean and
# range over replicates, and whether each verdict holds in all of them (src/plantbench/
# replicate_summary.py). Replicate r's jobs are the rules above with rep = replicates/<r>/.
rule replicates:
    input:
        [artifact("analysis", rep=r) for r in REPS],
        sections=config_input("replicates"),
    output:
        meta=artifact("replicates"),
        tables=[
            artifact("replicates", f"{name}.csv")
            for name in ["learned", "retrieval", "correlations", "ordering"]
        ],
    log:
        log_of("replicates"),
    benchmark:
        bench_of("replicates")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=2000,
        runtime=10,
    params:
        sections=sections("replicates"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} replicates -c {resources.run_config:q} 2> {log:q}"
