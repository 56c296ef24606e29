"""What several layers share: atomic files and secrets, deadline loops, processes by pidfile,
the template loader."""
