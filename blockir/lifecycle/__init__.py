"""Training and artifact lifecycle: run, checkpoint, telemetry, calibrate, diverge, migrate, release, canary, loading HF folders."""
