# The grounding suite (seed 002; plantbench.suites.grounding): contexts of atomic sentences in k segments
# under four conditions, each twin's greedy responses judged for entailment (one job per twin),
# and the seed's CK / PK / context-recall tables. Replicate 0 only (the study as configured).


rule grounding_build:
    input:
        facts=f"{R}/facts/meta.json",
        causal=f"{R}/causal/meta.json",
        tokenizer=f"{R}/tokenizer/meta.json",
        sections=config_input("grounding_build"),
    output:
        f"{R}/grounding/contexts/meta.json",
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
        contexts=f"{R}/grounding/contexts/meta.json",
        model=f"{R}/models/{{model}}/meta.json",
        sections=config_input("grounding_respond"),
    output:
        f"{R}/grounding/{{model}}/meta.json",
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
        expand("{R}/grounding/{model}/meta.json", R=R, model=MODELS),
        sections=config_input("grounding_analysis"),
    output:
        meta=f"{R}/grounding/analysis/meta.json",
        ck=report(
            f"{R}/grounding/analysis/ck_by_condition.csv",
            caption="../report/grounding_ck_table.rst",
            category="Grounding suite",
            labels={"table": "grounding CK by condition"},
        ),
        cr=report(
            f"{R}/grounding/analysis/cr_by_segment.csv",
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
