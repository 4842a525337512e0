# The study report (src/plantbench/report/): markdown, figures and the html page.


# the study's report: replicate 0's artifacts, and the summary over replicates when there are
# several (rule replicates in workflow/rules/grading.smk)
rule report:
    input:
        causal=artifact("causal", rep=""),
        reading=artifact("reading", rep=""),
        models=twins("pretrain", rep=""),
        analysis=artifact("analysis", rep=""),
        replicates=replicate_summary(),
        fidelity=fidelity_outputs(),
        context=artifact("context_analysis"),
        grounding=artifact("grounding_analysis"),
        membership=artifact("membership_analysis"),
        random=random_effect_input(),
        sections=config_input("report"),
    output:
        meta=artifact("report"),
        report=artifact("report", "report.md"),
        html=report(
            artifact("report", "report.html"),
            caption="../report/report.rst",
            category="Report",
        ),
        loss=report(
            artifact("report", "loss_curves.png"),
            caption="../report/loss_curves.rst",
            category="Training",
        ),
        reading=report(
            artifact("report", "reading_curve.png"),
            caption="../report/reading_curve.rst",
            category="Training",
        ),
        learned=report(
            artifact("report", "learned_rate.png"),
            caption="../report/learned_rate.rst",
            category="Ground truth",
        ),
        ap=report(
            artifact("report", "ap_by_n_docs.png"),
            caption="../report/ap_by_n_docs.rst",
            category="Analysis",
        ),
        mass=report(
            artifact("report", "mass_vs_effect.png"),
            caption="../report/mass_vs_effect.rst",
            category="Analysis",
        ),
        scatter=report(
            artifact("report", "mass_raw_scatter.png"),
            caption="../report/mass_raw_scatter.rst",
            category="Analysis",
        ),
        context_shift=report(
            artifact("report", "context_shift.png"),
            caption="../report/context_shift.rst",
            category="Context suite",
        ),
        context_ssp=report(
            artifact("report", "context_ssp.png"),
            caption="../report/context_ssp.rst",
            category="Context suite",
        ),
        grounding_ck=report(
            artifact("report", "grounding_ck.png"),
            caption="../report/grounding_ck.rst",
            category="Grounding suite",
        ),
        grounding_cr=report(
            artifact("report", "grounding_cr.png"),
            caption="../report/grounding_cr.rst",
            category="Grounding suite",
        ),
        membership_layers=report(
            artifact("report", "membership_layers.png"),
            caption="../report/membership_layers.rst",
            category="Membership suite",
        ),
    log:
        log_of("report"),
    benchmark:
        bench_of("report")
    conda:
        "../../envs/plantbench.yaml"
    threads: 1
    resources:
        run_config=RUN_CONFIG,
        mem_mb=plan_mem_mb("analysis+report", 2000),
        runtime=10,
    params:
        sections=sections("report"),
        plantbench=PLANTBENCH,
    shell:
        "{params.plantbench} report -c {resources.run_config:q} 2> {log:q}"
