"""KRaft: the Raft quorum that replicates ``__cluster_metadata`` (KIP-595, KIP-630, KIP-853)."""
