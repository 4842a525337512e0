# Facts, background corpus, tokenizer and the twin streams.


rule facts:
    input:
        sections=config_input("facts"),
    output:
        meta=artifact("facts"),
        tables=[
            artifact("facts", f"{name}.parquet")
            for name in ["facts", "documents", "distractors", "queries", "candidates"]
        ],
    log:
        log_of("facts"),
    benchmark:
        bench_of("facts")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("facts", 2000),
        runtime=10,
    params:
        sections=sections("facts"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} facts -c {resources.run_config:q} 2> {log:q}"


rule corpus:
    input:
        sections=config_input("corpus"),
    output:
        meta=artifact("corpus"),
        table=artifact("corpus", "corpus.parquet"),
    log:
        log_of("corpus"),
    benchmark:
        bench_of("corpus")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("corpus", 4000),
        runtime=corpus_runtime,
    params:
        sections=sections("corpus"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} corpus -c {resources.run_config:q} 2> {log:q}"


rule tokenizer:
    input:
        corpus=rules.corpus.output.meta,
        sections=config_input("tokenizer"),
    output:
        meta=artifact("tokenizer"),
    log:
        log_of("tokenizer"),
    benchmark:
        bench_of("tokenizer")
    conda:
        "../../envs/plantbench.yaml"
    threads: config["train"]["threads"]  # the tokenizers library encodes in parallel
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("tokenizer", 4000),
        runtime=tokenizer_runtime,
    params:
        sections=sections("tokenizer"),
        plantbench=PLANTBENCH,
    shell:
        "RAYON_NUM_THREADS={threads} {params.plantbench} tokenizer -c {resources.run_config:q} 2> {log:q}"


rule stream:
    input:
        facts=rules.facts.output.meta,
        corpus=rules.corpus.output.meta,
        tokenizer=rules.tokenizer.output.meta,
        sections=config_input("stream"),
    output:
        meta=twins("stream"),
        tokens=twins("stream", "tokens.bin"),
        manifest=twins("stream", "manifest.parquet"),
    log:
        rlog_of("stream"),
    benchmark:
        rbench_of("stream")
    conda:
        "../../envs/plantbench.yaml"
    threads: config["train"]["threads"]
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("stream", 4000),
        runtime=stream_runtime,
    params:
        replicate=replicate_of,
        sections=sections("stream"),
        plantbench=PLANTBENCH,
    shell:
        "RAYON_NUM_THREADS={threads} {params.plantbench} stream -c {resources.run_config:q} --replicate {params.replicate} 2> {log:q}"
