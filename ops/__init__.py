"""The process lifecycle: start, stop and status of the engine and the API, pid files, readiness,
the engine supervisor, and the cluster preflight and sync. Imports no MLX, no api, no engine."""
