"""Topic, group and topic-config filters with MM2's defaults (DefaultTopicFilter,
DefaultGroupFilter, DefaultConfigPropertyFilter): comma-separated lists of names or
regexes, joined with ``|`` and matched against the whole name; an empty list matches
nothing."""
from __future__ import annotations

import re

TOPICS_DEFAULT = ".*"
TOPICS_EXCLUDE_DEFAULT = r".*[\-\.]internal, .*\.replica, __.*"
GROUPS_DEFAULT = ".*"
GROUPS_EXCLUDE_DEFAULT = "console-consumer-.*, connect-.*, __.*"
CONFIG_PROPERTIES_EXCLUDE_DEFAULT = (r"follower\.replication\.throttled\.replicas, "
                                     r"leader\.replication\.throttled\.replicas, "
                                     r"message\.timestamp\.difference\.max\.ms, "
                                     r"message\.timestamp\.type, "
                                     r"unclean\.leader\.election\.enable, "
                                     r"min\.insync\.replicas")


def parse_list(value: str) -> list[str]:
    """A Kafka LIST config: comma-separated, items trimmed, "" is the empty list."""
    value = value.strip()
    return [] if not value else [s.strip() for s in value.split(",")]


def compile_pattern_list(value: str):
    items = parse_list(value)
    return re.compile("|".join(items)) if items else None


class _IncludeExclude:
    def __init__(self, include: str, exclude: str):
        self.include = compile_pattern_list(include)
        self.exclude = compile_pattern_list(exclude)

    def _accepts(self, name: str) -> bool:
        return (self.include is not None and self.include.fullmatch(name) is not None
                and not (self.exclude is not None and self.exclude.fullmatch(name) is not None))


class TopicFilter(_IncludeExclude):
    def __init__(self, topics: str = TOPICS_DEFAULT, topics_exclude: str = TOPICS_EXCLUDE_DEFAULT):
        super().__init__(topics, topics_exclude)

    def should_replicate_topic(self, topic: str) -> bool:
        return self._accepts(topic)


class GroupFilter(_IncludeExclude):
    def __init__(self, groups: str = GROUPS_DEFAULT, groups_exclude: str = GROUPS_EXCLUDE_DEFAULT):
        super().__init__(groups, groups_exclude)

    def should_replicate_group(self, group: str) -> bool:
        return self._accepts(group)


class ConfigPropertyFilter:
    def __init__(self, exclude: str = CONFIG_PROPERTIES_EXCLUDE_DEFAULT, use_defaults_from: str = "target"):
        self.exclude = compile_pattern_list(exclude)
        self.use_defaults_from = use_defaults_from

    def should_replicate_config_property(self, name: str) -> bool:
        return not (self.exclude is not None and self.exclude.fullmatch(name) is not None)

    def should_replicate_source_default(self, name: str) -> bool:
        return self.use_defaults_from == "source"
