# Paired pretraining: one job per twin; the two run concurrently.
# The resumable state under models/{model}/state/ is not a declared output, so a failed or
# preempted job keeps it and the retry resumes from it.


rule pretrain:
    input:
        stream=f"{R}/stream/{{model}}/meta.json",
        tokenizer=rules.tokenizer.output.meta,
    output:
        meta=f"{R}/models/{{model}}/meta.json",
        loss=f"{R}/models/{{model}}/loss.csv",
    log:
        log_of("pretrain_{model}"),
    benchmark:
        bench_of("pretrain_{model}")
    wildcard_constraints:
        model="A|B",
    conda:
        "../../envs/plantbench.yaml"
    threads: config["train"]["threads"]
    resources:
        run_config=RUN_CONFIG,
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        sections=sections("pretrain"),
        # train.devices > 1: one data-parallel process per GPU (torchrun picks a free port, so
        # both twins' jobs can share a node; `accelerate launch --multi_gpu` works the same way).
        # On Slurm also set `gpu: <devices>` under set-resources.pretrain in profiles/slurm.
        launch=(
            f"torchrun --standalone --nproc_per_node {config['train']['devices']} -m plantbench.cli"
            if config["train"]["devices"] > 1
            else "plantbench"
        ),
    shell:
        "{params.launch} pretrain -c {resources.run_config:q} --model {wildcards.model} --threads {threads} 2> {log:q}"
