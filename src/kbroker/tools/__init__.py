"""Operator tools shipped with the package: `kbroker topics` (kafka-topics.sh) and `kbroker dump-log` (kafka-dump-log.sh)."""
