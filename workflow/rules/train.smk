# Paired pretraining: one job per twin; the two run concurrently.
# The resumable state under models/{model}/state/ is not a declared output, so a failed or
# preempted job keeps it and the retry resumes from it.


rule pretrain:
    input:
        config=CONFIG_JSON,
        stream=f"{R}/stream/{{model}}/meta.json",
        tokenizer=rules.tokenizer.output.meta,
    output:
        meta=f"{R}/models/{{model}}/meta.json",
        loss=f"{R}/models/{{model}}/loss.csv",
    wildcard_constraints:
        model="A|B",
    log:
        log_of("pretrain_{model}"),
    benchmark:
        bench_of("pretrain_{model}")
    threads: config["train"]["threads"]
    resources:
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 60 * attempt,
    shell:
        "plantbench pretrain -c {input.config} --model {wildcards.model} --threads {threads} 2> {log}"
