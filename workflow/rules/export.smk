# `snakemake export`: the release bundle of a finished run (src/plantbench/ops/export.py; layout in
# results/README.md, export/): the tables as a datasets folder and plain parquet, the dataset
# card and both twins' final checkpoints. A target you ask for by name, not part of `all`.


rule export:
    input:
        facts=f"{R}/facts/meta.json",
        tokenizer=f"{R}/tokenizer/meta.json",
        causal=f"{R}/causal/meta.json",
        streams=expand("{R}/stream/{model}/meta.json", R=R, model=MODELS),
        pools=expand("{R}/pool/{model}/meta.json", R=R, model=MODELS),
        models=expand("{R}/models/{model}/meta.json", R=R, model=MODELS),
        scores=all_scores(""),  # replicate 0
        sections=config_input("export"),
    output:
        f"{R}/export/meta.json",
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
