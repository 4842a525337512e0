# Pretraining (src/plantbench/model/pretrain.py): the shared prefix once (the reading curriculum,
# identical in both streams; one job on all the twins' cores), then one job per twin from its
# state at the fork; the two twins run concurrently. Without train.prefix_steps each twin
# trains from step 0.
# The resumable state under models/{model}/state/ is not a declared output, so a failed or
# preempted job keeps it and the retry resumes from it.


rule pretrain_prefix:
    input:
        streams=twins("stream"),
        tokenizer=rules.tokenizer.output.meta,
        sections=config_input("pretrain_prefix"),
    output:
        meta=artifact("pretrain_prefix"),
    log:
        rlog_of("pretrain_prefix"),
    benchmark:
        rbench_of("pretrain_prefix")
    # the critical path: before anything else
    priority: 60
    conda:
        "../../envs/plantbench.yaml"
    threads: PREFIX_THREADS
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("pretrain_prefix", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("pretrain_prefix"),
        launch=PLANTBENCH_PRETRAIN,
    shell:
        "{params.launch} prefix -c {resources.run_config:q} --replicate {params.replicate} --threads {threads} 2> {log:q}"


rule pretrain:
    input:
        stream=stream_of,
        tokenizer=rules.tokenizer.output.meta,
        prefix=prefix_input,
        sections=config_input("pretrain"),
    output:
        meta=artifact("pretrain"),
        loss=artifact("pretrain", "loss.csv"),
    log:
        rlog_of("pretrain_{model}"),
    benchmark:
        rbench_of("pretrain_{model}")
    wildcard_constraints:
        model="A|B",
    # both twins first, side by side: the pretraining is the critical path of the DAG
    priority: 50
    conda:
        "../../envs/plantbench.yaml"
    threads: config["train"]["threads"]
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("pretrain", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("pretrain"),
        # one process, or one per GPU when train.devices > 1 (see config.smk)
        launch=PLANTBENCH_PRETRAIN,
    shell:
        "{params.launch} pretrain -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} --threads {threads} 2> {log:q}"
