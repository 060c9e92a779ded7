"""The launcher (run.py), the `vitsweep` command (cli.py), the launch's parts (launch/), the studies (studies/)."""
