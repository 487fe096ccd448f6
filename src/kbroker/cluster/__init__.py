"""A partition's replicas as its leader sees them (Kafka's ``kafka.cluster``): each
follower's fetch state, the ISR and its changes through the controller, and the high
watermark they allow. Pure state machines: no threads, no I/O, a clock passed in."""
