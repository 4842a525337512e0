# The analysis over replicates (config `replicates` > 1): every headline number as the mean and
# range over replicates, and whether each verdict holds in all of them (src/plantbench/
# replicate_summary.py). Replicate r's jobs are the rules above with rep = replicates/<r>/.


rule replicates:
    input:
        expand("{R}/{rep}analysis/meta.json", R=R, rep=REPS),
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
