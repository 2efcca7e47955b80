"""Bus tables syncloop writes, polled into memory (`tableview.TableView`): the pods'
volumes and the device plugins' resources, read by the Node status and /stats/summary
without a bus call on their path."""
