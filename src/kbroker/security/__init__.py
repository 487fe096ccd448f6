"""Security: what a listener's security protocol needs (Kafka's ``org.apache.kafka.common.security``).

* :mod:`~kbroker.security.tls`: Kafka's ``ssl.*`` settings (PEM keystores and truststores)
  -> an ``ssl.SSLContext``; the principal of a client certificate
  (``ssl.principal.mapping.rules``).
* :mod:`~kbroker.security.jaas`: Kafka's JAAS text (``sasl.jaas.config``).
* :mod:`~kbroker.security.scram`: RFC 5802 / 7677 SCRAM formulas and credentials.
* :mod:`~kbroker.security.sasl`: the per-connection :class:`~kbroker.security.sasl.ChannelSession`
  and the server side of SASL PLAIN and SCRAM-SHA-256/512.
* :mod:`~kbroker.security.credentials`: where SCRAM credentials come from (a small interface;
  the zero-config broker's MetadataStore implements it).
* :mod:`~kbroker.security.config`: the security keys of the broker config, per-listener
  overrides (``listener.name.<name>.<key>``) and a listener's :class:`ListenerSecurity`.

Layering: this package imports neither the server nor the network layer; both use it.
"""
