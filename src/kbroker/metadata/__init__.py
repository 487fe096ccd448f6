"""KRaft cluster metadata: the ``__cluster_metadata`` records (generated codecs in
``records``), their framing in the log, and the images brokers build from them."""
