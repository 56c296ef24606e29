"""Worker configuration: the runner's config format (written and read here), the env file and
the systemd units."""
