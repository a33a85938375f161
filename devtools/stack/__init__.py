"""Throwaway PostgreSQL, Apache Kafka and Tansu, the local pipeline and `make dev`."""
