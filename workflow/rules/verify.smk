# `snakemake verify`: recheck every artifact's hashes, lineage and the reference hashes.


rule verify:
    input:
        report=artifact("report", "report.md"),
        sections=config_input("verify"),
    output:
        f"{R}/verify.txt",
    log:
        log_of("verify"),
    benchmark:
        bench_of("verify")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=4000,
        runtime=30,
    params:
        sections=sections("verify"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} verify -c {resources.run_config:q} --out {output:q} > {log:q} 2>&1"
