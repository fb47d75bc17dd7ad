"""The /ui/ pages' static files (HTML, CSS, JS), served by `gateway.api.ui`. No third-party
assets, no inline script or style: the pages run under a strict Content-Security-Policy."""
