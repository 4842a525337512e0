# The membership suite (seed 001; plantbench.suites.membership): per twin, planted documents it read
# (members) and the other twin's (non-members), CRM's reality-monitoring probe with its baselines
# and controls (one job per twin), and the seed's Tables 1 and 2. Replicate 0 only.


rule membership_samples:
    input:
        facts=artifact("facts"),
        causal=artifact("causal", rep=""),
        sections=config_input("membership_samples"),
    output:
        artifact("membership_samples"),
    log:
        log_of("membership_samples"),
    benchmark:
        bench_of("membership_samples")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("membership_samples", 2000),
        runtime=10,
    params:
        sections=sections("membership_samples"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} membership-samples -c {resources.run_config:q} 2> {log:q}"


# GPU: forward passes with hidden states, greedy continuations and the text encoder; on a cluster
# it wants a GPU
rule membership_detect:
    input:
        samples=artifact("membership_samples"),
        model=artifact("pretrain", rep=""),
        tokenizer=artifact("tokenizer"),
        sections=config_input("membership_detect"),
    output:
        artifact("membership_detect"),
    log:
        log_of("membership_detect_{model}"),
    benchmark:
        bench_of("membership_detect_{model}")
    # the longest jobs first once the twins are trained (the run's tail is then short)
    priority: 20
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("membership_detect", 4000),
        runtime=lambda wc, attempt: 30 * attempt,
    params:
        sections=sections("membership_detect"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} membership-detect -c {resources.run_config:q} --model {wildcards.model} --threads {threads} 2> {log:q}"


rule membership_analysis:
    input:
        twins("membership_detect"),
        sections=config_input("membership_analysis"),
    output:
        meta=artifact("membership_analysis"),
        table1=report(
            artifact("membership_analysis", "table1.csv"),
            caption="../report/membership_table1.rst",
            category="Membership suite",
            labels={"table": "membership table 1"},
        ),
        table2=report(
            artifact("membership_analysis", "table2.csv"),
            caption="../report/membership_table2.rst",
            category="Membership suite",
            labels={"table": "membership table 2"},
        ),
    log:
        log_of("membership_analysis"),
    benchmark:
        bench_of("membership_analysis")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("membership_analysis", 2000),
        runtime=10,
    params:
        sections=sections("membership_analysis"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} membership-analysis -c {resources.run_config:q} 2> {log:q}"
