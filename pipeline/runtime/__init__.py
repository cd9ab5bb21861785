"""What runs the job and the SQL pipelines: the supervisor, the Spark session, the class archive."""
