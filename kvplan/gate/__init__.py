"""`kvplan check` and `kvplan check-log`: gate deployments in CI and compare a vLLM start-up log with the plan."""
