"""Operations: health and readiness, metrics, request ids and access logs, trusted proxies, shutdown."""
