"""HTTP/1.1 client: connections, pools per origin, redirects across origins."""
