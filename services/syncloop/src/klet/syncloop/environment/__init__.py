"""What a container sees of its pod: environment variables, DNS, /etc/hosts, and the ConfigMaps
and Secrets they read.
"""
