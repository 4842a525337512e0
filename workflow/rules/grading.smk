# Grading: retrieval metrics (AP, Recall@10), attributed mass and the within-cell correlations
# of every method in `methods.enabled` and `methods.plugins`, from the score artifacts and the
# causal answer key. One CLI call; the tables land in {R}/analysis/ (see results/README.md).
# With config `replicates` > 1, also the summary over replicates (rule replicates below).


rule analysis:
    input:
        causal=f"{RR}causal/meta.json",
        scores=all_scores(),
        sections=config_input("analysis"),
    output:
        meta=f"{RR}analysis/meta.json",
        retrieval=report(
            f"{RR}analysis/retrieval.csv",
            caption="../report/retrieval.rst",
            category="Analysis",
            labels={"table": "retrieval"},
        ),
        correlations=report(
            f"{RR}analysis/correlations.csv",
            caption="../report/correlations.rst",
            category="Analysis",
            labels={"table": "correlations"},
        ),
        learned=report(
            f"{RR}analysis/learned_grid.csv",
            caption="../report/learned_grid.rst",
            category="Analysis",
            labels={"table": "learned grid"},
        ),
        haystack=report(
            f"{RR}analysis/haystack.csv",
            caption="../report/haystack.rst",
            category="Analysis",
            labels={"table": "haystack"},
        ),
        per_fact=f"{RR}analysis/per_fact.parquet",
        per_query=f"{RR}analysis/per_query.parquet",
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
        expand("{R}/{rep}analysis/meta.json", R=R, rep=REPS),
        sections=config_input("replicates"),
    output:
        meta=f"{R}/replicates/summary/meta.json",
        tables=expand(
            "{R}/replicates/summary/{name}.csv",
            R=R,
            name=["learned", "retrieval", "correlations", "ordering"],
        ),
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
