# The causal ground truth: each fact's effect on the twin that read it, and the in-context check;
# the reading curve beside it
# (src/plantbench/truth/).


rule causal:
    input:
        facts=rules.facts.output.meta,
        models=twins("pretrain"),
        sections=config_input("causal"),
    output:
        meta=artifact("causal"),
        facts=artifact("causal", "facts.parquet"),
        queries=artifact("causal", "queries.parquet"),
    log:
        rlog_of("causal"),
    benchmark:
        rbench_of("causal")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("causal", 4000),
        runtime=30,
    params:
        replicate=replicate_of,
        sections=sections("causal"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} causal -c {resources.run_config:q} --replicate {params.replicate} --threads {threads} 2> {log:q}"


rule reading:
    input:
        facts=rules.facts.output.meta,
        models=twins("pretrain"),
        sections=config_input("reading"),
    output:
        meta=artifact("reading"),
    log:
        rlog_of("reading"),
    benchmark:
        rbench_of("reading")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("reading", 4000),
        runtime=30,
    params:
        replicate=replicate_of,
        sections=sections("reading"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} reading -c {resources.run_config:q} --replicate {params.replicate} --threads {threads} 2> {log:q}"
