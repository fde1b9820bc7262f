"""Full snapshots of partition state and the Spark job that compacts them."""
