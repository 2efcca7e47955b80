"""Device plugins (deviceplugin v1beta1): registration, devices, allocation, checkpoint."""
