# Pool, features (gradients per checkpoint and shard, curvature, hidden states, embeddings)
# and per-method scoring. all_scores(), the shard and checkpoint lists and the method -> feature
# files map (method_inputs) are in layout.smk.
# GPU: grads_pool, grads_queries, hidden, embed, ekfac and fidelity want a GPU on a cluster (the
# requests live in profiles/slurm under set-resources); pool, curvature and score are CPU-only.


rule pool:
    input:
        stream=stream_of,
        sections=config_input("pool"),
    output:
        meta=artifact("pool"),
        table=artifact("pool", "pool.parquet"),
    log:
        rlog_of("pool_{model}"),
    benchmark:
        rbench_of("pool_{model}")
    # a second's work that every twin's EK-FAC and gradient jobs wait for
    priority: 45
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("pool", 2000),
        runtime=lambda wc, attempt: 10 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("pool"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} pool -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} 2> {log:q}"


# GPU
rule grads_pool:
    input:
        pool=rules.pool.output.meta,
        model=artifact("pretrain"),
        sections=config_input("grads_pool"),
    output:
        artifact("grads_pool", "shard.json"),
    log:
        rlog_of("grads_pool_{model}_{checkpoint}_{shard}"),
    benchmark:
        rbench_of("grads_pool_{model}_{checkpoint}_{shard}")
    # the final checkpoint's shards first: they carry EK-FAC's factors (layout.smk)
    priority: grads_pool_priority
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("grads", 3000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("grads_pool"),
        plantbench=PLANTBENCH,
        factors=factors_flag,
    shell:
        "{params.plantbench} grads -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} "
        "--checkpoint {wildcards.checkpoint} --shard {wildcards.shard} {params.factors} --threads {threads} 2> {log:q}"


# GPU
rule grads_queries:
    input:
        facts=artifact("facts"),
        model=artifact("pretrain"),
        sections=config_input("grads_queries"),
    output:
        artifact("grads_queries", "shard.json"),
    log:
        rlog_of("grads_queries_{model}_{checkpoint}"),
    benchmark:
        rbench_of("grads_queries_{model}_{checkpoint}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("grads", 3000),
        runtime=lambda wc, attempt: 20 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("grads_queries"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} grads -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} "
        "--checkpoint {wildcards.checkpoint} --queries --threads {threads} 2> {log:q}"


rule curvature:
    input:
        shards=pool_shards,
        sections=config_input("curvature"),
    output:
        npz=artifact("curvature", "curvature.npz"),
        meta=artifact("curvature"),
    log:
        rlog_of("curvature_{model}_{checkpoint}"),
    benchmark:
        rbench_of("curvature_{model}_{checkpoint}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("curvature", 4000),
        runtime=lambda wc, attempt: 20 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("curvature"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} curvature -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} "
        "--checkpoint {wildcards.checkpoint} 2> {log:q}"


# GPU
rule hidden:
    input:
        pool=rules.pool.output.meta,
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        model=artifact("pretrain"),
        sections=config_input("hidden"),
    output:
        artifact("hidden"),
    log:
        rlog_of("hidden_{model}"),
    benchmark:
        rbench_of("hidden_{model}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("hidden", 4000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("hidden"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} hidden -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} --threads {threads} 2> {log:q}"


# GPU
rule embed_shared:
    input:
        pools=twins("pool"),
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        sections=config_input("embed_shared"),
    output:
        artifact("embed_shared"),
    log:
        rlog_of("embed_shared"),
    benchmark:
        rbench_of("embed_shared")
    # the longest jobs first once the twins are trained (the run's tail is then short)
    priority: 30
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("embed", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("embed_shared"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} embed-shared -c {resources.run_config:q} --replicate {params.replicate} --threads {threads} 2> {log:q}"


rule embed:
    input:
        pool=rules.pool.output.meta,
        shared=rules.embed_shared.output,
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        sections=config_input("embed"),
    output:
        artifact("embed"),
    log:
        rlog_of("embed_{model}"),
    benchmark:
        rbench_of("embed_{model}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("embed", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("embed"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} embed -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} --threads {threads} 2> {log:q}"


rule score:
    input:
        pool=rules.pool.output.meta,
        facts=artifact("facts"),
        model=artifact("pretrain"),
        features=method_inputs,
        code=method_code,
        sections=config_input("score"),
    output:
        artifact("score"),
    log:
        rlog_of("score_{method}_{model}"),
    benchmark:
        rbench_of("score_{method}_{model}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("score", 4000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("score"),
        plantbench=PLANTBENCH,
        # the hash of the method's own code and its plug-in entry: editing a plug-in reruns
        # exactly its two score jobs, adding one reruns no other method's
        method=lambda wc: _pbrun.method_signature(config, wc.method),
    shell:
        "{params.plantbench} score -c {resources.run_config:q} --replicate {params.replicate} --method {wildcards.method} "
        "--model {wildcards.model} --threads {threads} 2> {log:q}"


# GPU
# GPU
rule ekfac:
    input:
        pool=rules.pool.output.meta,
        shards=ekfac_shards,
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        model=artifact("pretrain"),
        sections=config_input("ekfac"),
    output:
        artifact("ekfac"),
    log:
        rlog_of("ekfac_{model}"),
    benchmark:
        rbench_of("ekfac_{model}")
    # the longest jobs first once the twins are trained (the run's tail is then short)
    priority: 40
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("ekfac", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        # + ASTRA's settings where it is enabled (layout.smk): unchanged for a run without it
        sections=sections("ekfac") + ASTRA,
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} ekfac -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} --threads {threads} 2> {log:q}"


# GPU
# tracin_ekfac only (off by default): EK-FAC at each TracIn checkpoint but the final one (rule ekfac)
rule ekfac_tracin:
    input:
        pool=rules.pool.output.meta,
        shards=ekfac_shards,
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        model=artifact("pretrain"),
        sections=config_input("ekfac_tracin"),
    output:
        artifact("ekfac_tracin"),
    log:
        rlog_of("ekfac_{model}_{checkpoint}"),
    benchmark:
        rbench_of("ekfac_{model}_{checkpoint}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("ekfac_tracin", 4000),
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("ekfac_tracin"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} ekfac -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} "
        "--checkpoint {wildcards.checkpoint} --threads {threads} 2> {log:q}"


# GPU
# trackstar only (off by default): one more gradient pass over the pool and the queries at the
# final checkpoint, optimizer-corrected (Adam's second moments saved beside the checkpoint)
rule trackstar:
    input:
        pool=rules.pool.output.meta,
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        model=artifact("pretrain"),
        sections=config_input("trackstar"),
    output:
        artifact("trackstar"),
    log:
        rlog_of("trackstar_{model}"),
    benchmark:
        rbench_of("trackstar_{model}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=lambda wc, attempt: 4000 * attempt,
        runtime=lambda wc, attempt: 60 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("trackstar"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} trackstar -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} --threads {threads} 2> {log:q}"


rule fidelity:
    input:
        pool=rules.pool.output.meta,
        facts=artifact("facts"),
        tokenizer=rules.tokenizer.output.meta,
        model=artifact("pretrain"),
        features=fidelity_inputs,
        sections=config_input("fidelity"),
    output:
        artifact("fidelity"),
    log:
        rlog_of("fidelity_{model}"),
    benchmark:
        rbench_of("fidelity_{model}")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("fidelity", 6000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        replicate=replicate_of,
        sections=sections("fidelity"),
        plantbench=PLANTBENCH,
        # the gradient methods it grades (adding a method of another kind reruns nothing here)
        methods=",".join(FIDELITY_METHODS),
    shell:
        "{params.plantbench} fidelity -c {resources.run_config:q} --replicate {params.replicate} --model {wildcards.model} --threads {threads} 2> {log:q}"
