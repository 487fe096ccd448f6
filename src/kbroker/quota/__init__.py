"""Client quotas (Kafka's ``kafka.server.ClientQuotaManager`` family, KIP-13/KIP-55/KIP-124/KIP-219).

| Module | Owns | Kafka model |
|---|---|---|
| ``rate.py`` | a windowed rate (samples of a window each) | ``Rate`` / ``SampledStat`` / ``WindowedSum`` |
| ``entity.py`` | entities (user, client-id, ip), quota keys, alter/describe rules | ``ClientQuotaControlManager``, ``ClientQuotasImage`` |
| ``manager.py`` | per user/client-id sensors, bounds, throttle time | ``ClientQuotaManager``, ``ClientRequestQuotaManager`` |
"""
