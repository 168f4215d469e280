"""The user's machine: where the app keeps its files, the settings, API keys in the keyring, the
log file and the servers list."""
