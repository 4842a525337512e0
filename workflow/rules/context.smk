# The context-attribution suite (seed 000; plantbench.suites.context): contexts with each segment's
# provenance, every context method under each twin (one job per twin), and the seed's metrics.
# Replicate 0 only (the study as configured).


rule context_build:
    input:
        facts=artifact("facts"),
        causal=artifact("causal", rep=""),
        tokenizer=artifact("tokenizer"),
        sections=config_input("context_build"),
    output:
        artifact("context_build"),
    log:
        log_of("context_build"),
    benchmark:
        bench_of("context_build")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("context_build", 2000),
        runtime=10,
    params:
        sections=sections("context_build"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} context-build -c {resources.run_config:q} 2> {log:q}"


# GPU: a forward-only job (2^k ablations x candidates per context); on a cluster it wants a GPU
rule context_attribute:
    input:
        contexts=artifact("context_build"),
        model=artifact("pretrain", rep=""),
        sections=config_input("context_attribute"),
    output:
        artifact("context_attribute"),
    log:
        log_of("context_attribute_{model}"),
    benchmark:
        bench_of("context_attribute_{model}")
    # the longest jobs first once the twins are trained (the run's tail is then short)
    priority: 20
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("context_attribute", 4000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        sections=sections("context_attribute"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} context-attribute -c {resources.run_config:q} --model {wildcards.model} --threads {threads} 2> {log:q}"


rule context_analysis:
    input:
        twins("context_attribute"),
        sections=config_input("context_analysis"),
    output:
        meta=artifact("context_analysis"),
        table1=report(
            artifact("context_analysis", "table1.csv"),
            caption="../report/context_table1.rst",
            category="Context suite",
            labels={"table": "context table 1"},
        ),
        table2=report(
            artifact("context_analysis", "table2.csv"),
            caption="../report/context_table2.rst",
            category="Context suite",
            labels={"table": "context table 2"},
        ),
        ssp=report(
            artifact("context_analysis", "ssp.csv"),
            caption="../report/context_ssp_table.rst",
            category="Context suite",
            labels={"table": "context SSP"},
        ),
    log:
        log_of("context_analysis"),
    benchmark:
        bench_of("context_analysis")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("context_analysis", 2000),
        runtime=10,
    params:
        sections=sections("context_analysis"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} context-analysis -c {resources.run_config:q} 2> {log:q}"
