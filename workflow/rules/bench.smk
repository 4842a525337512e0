# `snakemake bench` (not part of `all`): measured speed of training, featurization and scoring
# on this machine against its measured matmul peak, plus the study's wall time per rule (from
# the `benchmark:` files of the rules that ran). See src/plantbench/ops/bench/groups.py.


rule bench:
    input:
        sections=config_input("bench"),
    output:
        csv=f"{R}/benchmarks/benchmarks.csv",
        profile=f"{R}/benchmarks/train_profile.txt",
    log:
        log_of("bench"),
    benchmark:
        bench_of("bench")
    conda:
        "../../envs/plantbench.yaml"
    threads: config["train"]["threads"]
    resources:
        run_config=RUN_CONFIG,
        mem_mb=8000,
        runtime=60,
    params:
        sections=sections("bench"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} bench -c {resources.run_config:q} --threads {threads} > {log:q} 2>&1"
