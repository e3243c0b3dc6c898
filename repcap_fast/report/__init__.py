"""`repcap report`: the analysis of one real model, written as report.json (full provenance),
report.md (a readable summary) and PNG plots; a model beside its random-init control; several
models side by side (`repcap survey`).

A report on one model (`run_report`, configured by `ReportSettings`) runs these stages, one
function each (`.stages`):

1. the embedding matrices (`embeddings_stage`) and the settings checked against the model
   (`check_model_settings`);
2. the hidden states of a seeded token sample (`hidden_states_stage`);
3. ε of the embedding matrix, streamed over all pairs and exact through the Gram identity, with
   its class, the capacity table with the Welch floor, a histogram plot, and the
   embedding-vs-unembedding statistics when the two are untied (`epsilon_stage`);
4. the Subspace-PGA profile: z per layer for every CCR variant with the null band (`pga_stage`);
5. spectral metrics per layer (RankMe, α-ReQ, isotropy, condition number) and the alignment of
   the top principal directions with the readout subspace (`spectral_stage`);
6. with a probe file, linear-probe accuracy per layer (`probe_stage`);

and records where everything came from: source, files, tensor names, ties, text, token sample,
seeds, versions, and the time of each stage. `report_markdown` writes the summary
(`.writers`); `run_control_report` runs the control (`.pipeline`, `.control`); `run_survey` and
`run_pga_survey` run surveys (`.survey`).
"""

from .._deprecated import moved_names as _moved_names
from .analyses import embedding_vs_unembedding, epsilon_analysis, spectral_profile
from .control import control_markdown
from .pipeline import run_control_report, run_report
from .settings import CONTROLS, REPORT_FILES, REPORT_SECTIONS, ReportSettings
from .stages import (
    ReportModel,
    check_model_settings,
    embeddings_stage,
    epsilon_stage,
    hidden_states_stage,
    pga_stage,
    probe_stage,
    spectral_stage,
)
from .survey import AGREEMENT_DEPTHS, SURVEY_FILES, pga_survey_markdown, run_pga_survey, run_survey
from .writers import report_markdown, write_report

__all__ = [
    "run_report", "ReportSettings", "ReportModel",
    "embeddings_stage", "check_model_settings", "hidden_states_stage", "epsilon_stage", "pga_stage",
    "spectral_stage", "probe_stage",
    "epsilon_analysis", "embedding_vs_unembedding", "spectral_profile",
    "report_markdown", "write_report",
    "run_control_report", "control_markdown", "CONTROLS",
    "run_survey", "run_pga_survey", "pga_survey_markdown", "AGREEMENT_DEPTHS", "SURVEY_FILES",
    "REPORT_FILES", "REPORT_SECTIONS",
]

__getattr__ = _moved_names(__name__, {name: ("repcap_fast.plotting", name) for name in
                                     ("plot_cosine_histograms", "plot_pga_profile", "plot_spectral")})
