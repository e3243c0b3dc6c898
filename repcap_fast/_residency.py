"""Where data leaves its device on purpose, and why.

Every op keeps its inputs and its working tensors on the device they are on; what comes back to
the host is a summary whose size does not grow with V or N (a few moments, a histogram of `bins`
counts, a list of ρ's), read once at the end. The report keeps the hidden states, the readout
basis and the embeddings on the analysis device from the model run to the last op.

tests/test_device_residency.py records every host copy the package's own code makes (`.cpu()`,
`.numpy()`, `.tolist()`, `.to("cpu")`; scalar reads aside) while the ops and a whole report run,
and fails on one made anywhere not listed here. Keys: (file relative to repcap_fast/, or
triton_kernels/ for the Triton launchers, function).
"""

HOST_COPIES = {
    ("ops/pairwise_cosine_stats.py", "_pairwise_cosine_stats.<locals>.run_mine"):
        "the op's result: per pass, 4 float64 moments, 3 counts and the `bins` histogram counts, summed on the "
        "host in float64/int64 across passes and ranks",
    ("ops/pairwise_cosine_stats.py", "merge_partials"):
        "the op's result: the merged moments and counts (7 numbers per pass) read once",
    ("ops/pairwise_cosine_stats.py", "kernel_operand"):
        "the smallest and largest row norm (2 numbers, one synchronization) that choose the kernel's scaling",
    ("ops/_pairwise_cosine_stats_results.py", "CosineStats.quantile"):
        "the result's histogram (already on the host) read as numpy",
    ("reference.py", "histogram_bins"):
        "the torch backend's histogram counts (`bins` numbers) per block, its result",
    ("triton_kernels/pairwise_cosine_stats.py", "pairwise_cosine_stats_triton"):
        "the op's result: one float64 sum and sum of squares per persistent program (as many as the GPU has "
        "slots for, not growing with V), merged on the host in a fixed order, and the merged `bins` histogram",
    ("triton_kernels/subspace_pga.py", "subspace_pga_rhos_triton"):
        "the op's result: one Spearman ρ per subspace of the batch",
    ("ops/subspace_pga.py", "_rhos_in_batches"):
        "the op's result: one Spearman ρ per subspace, read once per batch",
    ("ops/subspace_pga.py", "_subspace_rhos_stream"):
        "method='stream': per batch, one zero-norm flag and one Spearman ρ per subspace",
    ("ops/subspace_pga.py", "_subspace_pga"):
        "across ranks: every rank's ρ's summed, one per subspace",
    ("ops/gram_offdiag_penalty.py", "_check_rows"):
        "an error message: the indices of at most 10 zero rows",
    ("_validation.py", "drop_zero_rows"):
        "an error message: the indices of at most 10 zero rows",
    ("_validation.py", "unit_rows"):
        "the indices of the rows whose norm overflows float64 (each is rescaled on the device)",
    ("_validation.py", "as_rank_keys"):
        "rank keys given as Python or numpy values, checked on the host before they become a tensor",
    ("geometry.py", "content_digest"):
        "CPU tensors only (the branch is guarded by device.type == 'cpu'): their bytes are hashed in place; "
        "tensors on a GPU are fingerprinted on the device",
    ("geometry.py", "_device_fingerprint"):
        "the digest of a tensor on a GPU (the readout-basis cache key): two 31-bit hashes per 1 MiB chunk, "
        "merged on the host; the tensor's data stays on the device",
    ("spectral.py", "spectral_metrics"):
        "the result: the readout alignment of the top m principal directions (m numbers)",
    ("report/analyses.py", "spectral_profile"):
        "the result: those m numbers written into report.json",
    ("models/hidden_states.py", "hidden_states"):
        "token ids passed as a tensor on a GPU: the windows and the token sample are cut and indexed on the host "
        "(N integers); the batches go back to the model's device",
    ("models/hidden_states.py", "HiddenStates.to_dict"):
        "provenance: the sampled token ids, windows and offsets (N integers each) written into report.json",
    ("probes.py", "probe_accuracy"):
        "scikit-learn fits the probes on the host: the pooled representations of the labelled texts (one d-vector "
        "per text and layer)",
    ("plotting.py", "plot_cosine_histograms"):
        "the plot: the result's histogram (already on the host) read as numpy",
}
