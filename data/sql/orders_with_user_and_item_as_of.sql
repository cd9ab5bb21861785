-- Beyond the seed: temporal joins one after another, as the job's event time enriches an order.
-- Each order with its user's tier and its item's price as they were at the order's time. An order
-- is sent once all three tables' watermarks pass its time (orders' runs 5 s behind the newest
-- order_time read, the others' at their newest updated_at), so the last row of each table waits
-- for a later one. An order of no known user gets NULLs (LEFT JOIN); an order of an item with no
-- price at its time is dropped ([INNER] JOIN). Times are JSON text: "2024-05-01 10:00:00.000".
-- Run: python -m pipeline sql data/sql/orders_with_user_and_item_as_of.sql

CREATE TABLE orders (
id STRING,
user_id STRING,
item_id STRING,
quantity INT,
order_time TIMESTAMP(3),
WATERMARK FOR order_time AS order_time - INTERVAL '5' SECOND,
PRIMARY KEY (id) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/sql_item_orders',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE user_profiles (
id STRING,
name STRING,
tier STRING,
updated_at TIMESTAMP(3),
WATERMARK FOR updated_at AS updated_at,
PRIMARY KEY (id) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/user_profiles',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE item_prices (
id STRING,
price DOUBLE,
updated_at TIMESTAMP(3),
WATERMARK FOR updated_at AS updated_at,
PRIMARY KEY (id) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/item_prices',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

CREATE TABLE orders_priced_as_of (
orderId STRING,
userTier STRING,
itemId STRING,
unitPrice DOUBLE,
total DOUBLE,
PRIMARY KEY (orderId) NOT ENFORCED
) WITH (
'connector' = 'upsert-pulsar',
'topic' = 'persistent://public/default/orders_priced_as_of',
'key.format' = 'raw',
'value.format' = 'json',
'service-url' = 'pulsar://localhost:6650',
'admin-url' = 'http://localhost:8080'
);

INSERT INTO orders_priced_as_of (orderId, userTier, itemId, unitPrice, total)
SELECT
o.id,
COALESCE(u.tier, 'unknown'),
o.item_id,
i.price,
o.quantity * i.price
FROM orders AS o
LEFT JOIN user_profiles FOR SYSTEM_TIME AS OF o.order_time AS u ON o.user_id = u.id
JOIN item_prices FOR SYSTEM_TIME AS OF o.order_time AS i ON o.item_id = i.id;
