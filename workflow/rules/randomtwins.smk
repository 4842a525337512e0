# Random twins (plantbench.randomtwins; opt-in: random_twins.m > 0, the preset
# workflow/presets/random_twins.yaml): m more twins from replicate 0's shared prefix, each reading
# a seeded half of the fact pairs, one job per draw (resumable, like a twin); then one step that
# scores their answers, gives each fact's effect a standard error and every method an LDS.


rule random_twin:
    input:
        streams=twins("stream", rep=""),
        tokenizer=rules.tokenizer.output.meta,
        prefix=artifact("pretrain_prefix", rep=""),
        facts=rules.facts.output.meta,
        sections=config_input("random_twin"),
    output:
        meta=artifact("random_twin"),
    log:
        log_of("random_twin_{draw}"),
    benchmark:
        bench_of("random_twin_{draw}")
    # after the twins, before the attribution steps: each is as long as one twin's paired part
    priority: 40
    conda:
        "../../envs/plantbench.yaml"
    threads: config["train"]["threads"]
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("random_twin", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        sections=sections("random_twin"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} random-twin -c {resources.run_config:q} --draw {wildcards.draw} --threads {threads} 2> {log:q}"


rule random_effect:
    input:
        twins=random_twins_all(),
        causal=artifact("causal", rep=""),
        analysis=artifact("analysis", rep=""),
        sections=config_input("random_effect"),
    output:
        meta=artifact("random_effect"),
    log:
        log_of("random_effect"),
    benchmark:
        bench_of("random_effect")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("random_effect", 4000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        sections=sections("random_effect"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} random-effect -c {resources.run_config:q} --threads {threads} 2> {log:q}"
