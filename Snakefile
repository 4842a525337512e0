# plantbench: the paired-pretraining attribution study as a Snakemake DAG.
# Each rule is one call of the `plantbench` CLI; the logic lives in src/plantbench/.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


# one rules file per stage, each named after its package or module in src/plantbench/; every
# artifact path comes from the stage catalogue (src/plantbench/stages.py) through artifact() in
# workflow/rules/layout.smk
include: "workflow/rules/config.smk"
include: "workflow/rules/layout.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/truth.smk"
include: "workflow/rules/attribution.smk"
include: "workflow/rules/grading.smk"
include: "workflow/rules/randomtwins.smk"
include: "workflow/rules/context.smk"
include: "workflow/rules/grounding.smk"
include: "workflow/rules/membership.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/export.smk"


rule all:
    default_target: True
    input:
        artifact("report", "report.md"),
        [artifact("analysis", rep=r) for r in REPS],  # every replicate
        random_effect_input(),  # the random twins (random_twins.m > 0), also on a finished run
