"""The `specsim` command line (click), installed as ``specsim.cli``: :mod:`.main` holds the
group and its entry point, each other module one command or family of commands, and
:mod:`.defaults` the defaults they share."""
