"""The broker: request handling, replica management, purgatory, start-up."""
