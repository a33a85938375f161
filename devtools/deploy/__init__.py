"""Offline checks of the Dockerfile, docker-compose.yml, k8s/ and the monitoring files."""
