# Facts, background corpus, tokenizer and the twin streams.


rule config:
    output:
        CONFIG_JSON,
    log:
        log_of("config"),
    benchmark:
        bench_of("config")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    params:
        cfg=json.dumps(config, sort_keys=True),
    shell:
        "plantbench config --json {params.cfg:q} --out {output} 2> {log}"


rule facts:
    input:
        CONFIG_JSON,
    output:
        meta=f"{R}/facts/meta.json",
        tables=expand(
            "{R}/facts/{name}.parquet",
            R=R,
            name=["facts", "documents", "distractors", "queries", "candidates"],
        ),
    log:
        log_of("facts"),
    benchmark:
        bench_of("facts")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "plantbench facts -c {input} 2> {log}"


rule corpus:
    input:
        CONFIG_JSON,
    output:
        meta=f"{R}/corpus/meta.json",
        table=f"{R}/corpus/corpus.parquet",
    log:
        log_of("corpus"),
    benchmark:
        bench_of("corpus")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "plantbench corpus -c {input} 2> {log}"


rule tokenizer:
    input:
        config=CONFIG_JSON,
        corpus=rules.corpus.output.meta,
    output:
        meta=f"{R}/tokenizer/meta.json",
    log:
        log_of("tokenizer"),
    benchmark:
        bench_of("tokenizer")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "plantbench tokenizer -c {input.config} 2> {log}"


rule stream:
    input:
        config=CONFIG_JSON,
        facts=rules.facts.output.meta,
        corpus=rules.corpus.output.meta,
        tokenizer=rules.tokenizer.output.meta,
    output:
        meta=expand("{R}/stream/{model}/meta.json", R=R, model=MODELS),
        tokens=expand("{R}/stream/{model}/tokens.bin", R=R, model=MODELS),
        manifest=expand("{R}/stream/{model}/manifest.parquet", R=R, model=MODELS),
    log:
        log_of("stream"),
    benchmark:
        bench_of("stream")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    shell:
        "plantbench stream -c {input.config} 2> {log}"
