"""Traffic with reuse: sessions, traces and shared prefixes (kvplan.traffic.model), their loaders
(kvplan.traffic.loaders) and the token ids a replay sends (kvplan.traffic.tokens)."""
