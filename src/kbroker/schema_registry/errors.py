"""The registry's REST errors: HTTP status plus Confluent's ``error_code`` and message.

Codes and message formats follow Confluent Schema Registry's documented errors
(``{"error_code": 40401, "message": "Subject 'x' not found."}``); clients such as
confluent-kafka's ``SchemaRegistryClient`` surface both fields as they are.
"""
from __future__ import annotations


class RestError(Exception):
    def __init__(self, status: int, error_code: int, message: str):
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message

    def body(self) -> dict:
        return {"error_code": self.error_code, "message": self.message}


def subject_not_found(subject: str) -> RestError:
    return RestError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(version) -> RestError:
    return RestError(404, 40402, f"Version {version} not found.")


def schema_not_found(schema_id=None) -> RestError:
    return RestError(404, 40403, "Schema not found" if schema_id is None else f"Schema {schema_id} not found")


def subject_soft_deleted(subject: str) -> RestError:
    return RestError(404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")


def subject_not_soft_deleted(subject: str) -> RestError:
    return RestError(404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted")


def version_soft_deleted(subject: str, version) -> RestError:
    return RestError(404, 40406, f"Subject '{subject}' Version {version} was soft deleted."
                                 "Set permanent=true to delete permanently")


def version_not_soft_deleted(subject: str, version) -> RestError:
    return RestError(404, 40407, f"Subject '{subject}' Version {version} was not deleted first "
                                 "before being permanently deleted")


def subject_compatibility_not_configured(subject: str) -> RestError:
    return RestError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")


def subject_mode_not_configured(subject: str) -> RestError:
    return RestError(404, 40409, f"Subject '{subject}' does not have subject-level mode configured")


def incompatible(subject: str, details: list[str]) -> RestError:
    return RestError(409, 409, f'Schema being registered is incompatible with an earlier schema for subject '
                               f'"{subject}", details: [{", ".join(details)}]')


def invalid_schema(reason: str) -> RestError:
    return RestError(422, 42201, f"Invalid schema {reason}")


def invalid_version(version: str) -> RestError:
    return RestError(422, 42202, f"The specified version '{version}' is not a valid version id. Allowed values "
                                 'are between [1, 2^31-1] and the string "latest"')


def invalid_compatibility_level() -> RestError:
    return RestError(422, 42203, "Invalid compatibility level. Valid values are none, backward, forward, full, "
                                 "backward_transitive, forward_transitive, and full_transitive")


def invalid_mode(mode) -> RestError:
    return RestError(422, 42204, f"Invalid mode. Valid values are READWRITE, READONLY, READONLY_OVERRIDE "
                                 f"and IMPORT; got {mode!r}")


def operation_not_permitted(message: str) -> RestError:
    return RestError(422, 42205, message)


def reference_exists(message: str) -> RestError:
    return RestError(422, 42206, message)


def id_does_not_match(message: str) -> RestError:
    return RestError(422, 42207, message)


def schema_too_large(limit: int) -> RestError:
    return RestError(422, 42209, f"Schema too large: the request body exceeds {limit} bytes")


def store_error(message: str) -> RestError:
    return RestError(500, 50001, f"Error while storing the schema registry's state: {message}")


def operation_timeout(message: str) -> RestError:
    return RestError(500, 50002, message)
