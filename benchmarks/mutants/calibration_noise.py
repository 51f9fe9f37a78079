"""Mutations of the calibration's noise estimate and the mixed-step host cost (issue 32)."""

FIT = "tests/test_calibration_fit.py"

MUTATIONS = [
    ("noise-biased-variance", "backends/calibration_provenance.py",
     "            dof += len(seconds) - 1", "            dof += len(seconds)", (FIT,), "backends"),
    ("noise-cv-is-sigma", "backends/calibration_provenance.py",
     "    cv = math.sqrt(math.expm1(sigma * sigma))", "    cv = sigma", (FIT,), "backends"),
    ("mixed-cost-on-prefill-only-steps", "backends/token_model.py",
     "        if 0 < prefill_rows < rows:  # decodes beside prefills",
     "        if 0 < prefill_rows <= rows:  # decodes beside prefills", (FIT,), "backends"),
    ("mixed-column-counts-prefills", "backends/calibration_fit.py",
     "    mixed = [float(s.num_prefills > 0 and s.decode > 0) for s in samples]",
     "    mixed = [float(s.num_prefills) for s in samples]", (FIT,), "backends"),
    ("noise-cap-dropped", "backends/calibration_provenance.py", '    noise = {"cv": min(cv, MAX_NOISE_CV),',
     '    noise = {"cv": cv,', (FIT,), "backends"),
]
