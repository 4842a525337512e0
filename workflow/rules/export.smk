# `snakemake export`: the release bundle of a finished run (src/plantbench/ops/export.py; layout in
# results/README.md, export/): the tables as a datasets folder and plain parquet, the dataset
# card and both twins' final checkpoints. A target you ask for by name, not part of `all`.


rule export:
    input:
        facts=artifact("facts"),
        tokenizer=artifact("tokenizer"),
        causal=artifact("causal", rep=""),
        streams=twins("stream", rep=""),
        pools=twins("pool", rep=""),
        models=twins("pretrain", rep=""),
        scores=all_scores(""),  # replicate 0
        sections=config_input("export"),
    output:
        artifact("export"),
    log:
        log_of("export"),
    benchmark:
        bench_of("export")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        sections=sections("export"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} export -c {resources.run_config:q} 2> {log:q}"
