# `snakemake verify`: recheck every artifact's hashes, lineage and the reference hashes.


rule verify:
    input:
        report=f"{R}/report/report.md",
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
        mem_mb=4000,
        runtime=30,
    params:
        config=CONFIG_JSON,
        sections=sections(*config),
    shell:
        "plantbench verify -c {params.config} --out {output} > {log} 2>&1"
