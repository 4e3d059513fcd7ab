"""Running the long-lived commands in production: signals, Prometheus metrics, health endpoints."""
