# Formgrader opens inside JupyterLab in an iframe of the instructor's own server. With one subdomain per user
# (hub.config.JupyterHub.subdomain_host in values.yaml), 'self' is this user's own origin only (nbgrader #1870).
c = get_config()  # noqa: F821
c.ServerApp.tornado_settings = {"headers": {"Content-Security-Policy": "frame-ancestors 'self'"}}
