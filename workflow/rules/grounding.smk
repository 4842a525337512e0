# The grounding suite (seed 002; plantbench.suites.grounding): contexts of atomic sentences in k segments
# under four conditions, each twin's greedy responses judged for entailment (one job per twin),
# and the seed's CK / PK / context-recall tables. Replicate 0 only (the study as configured).


rule grounding_build:
    input:
        facts=artifact("facts"),
        causal=artifact("causal", rep=""),
        tokenizer=artifact("tokenizer"),
        sections=config_input("grounding_build"),
    output:
        artifact("grounding_build"),
    log:
        log_of("grounding_build"),
    benchmark:
        bench_of("grounding_build")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("grounding_build", 2000),
        runtime=10,
    params:
        sections=sections("grounding_build"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} grounding-build -c {resources.run_config:q} 2> {log:q}"


# GPU: greedy generation (and the NLI model when configured); on a cluster it wants a GPU
rule grounding_respond:
    input:
        contexts=artifact("grounding_build"),
        model=artifact("pretrain", rep=""),
        sections=config_input("grounding_respond"),
    output:
        artifact("grounding_respond"),
    log:
        log_of("grounding_respond_{model}"),
    benchmark:
        bench_of("grounding_respond_{model}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("grounding_respond", 4000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        sections=sections("grounding_respond"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} grounding-respond -c {resources.run_config:q} --model {wildcards.model} --threads {threads} 2> {log:q}"


rule grounding_analysis:
    input:
        twins("grounding_respond"),
        sections=config_input("grounding_analysis"),
    output:
        meta=artifact("grounding_analysis"),
        ck=report(
            artifact("grounding_analysis", "ck_by_condition.csv"),
            caption="../report/grounding_ck_table.rst",
            category="Grounding suite",
            labels={"table": "grounding CK by condition"},
        ),
        cr=report(
            artifact("grounding_analysis", "cr_by_segment.csv"),
            caption="../report/grounding_cr_table.rst",
            category="Grounding suite",
            labels={"table": "grounding CR by segment"},
        ),
    log:
        log_of("grounding_analysis"),
    benchmark:
        bench_of("grounding_analysis")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("grounding_analysis", 2000),
        runtime=10,
    params:
        sections=sections("grounding_analysis"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} grounding-analysis -c {resources.run_config:q} 2> {log:q}"
