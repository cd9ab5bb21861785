"""The driver's class archive: used when built, left out when not (pure, no JVM)."""

from __future__ import annotations

from pipeline.runtime.class_archive import QUIET, driver_java_options, one_word


def test_options_point_at_the_archive_when_it_is_there(tmp_path):
    archive = tmp_path / "spark-classes.jsa"
    assert driver_java_options(archive) == ""
    archive.write_bytes(b"\0")
    options = driver_java_options(archive)
    assert options.startswith(f"-XX:SharedArchiveFile={archive} ") and options.endswith(QUIET)


def test_an_option_with_a_path_stays_one_word_of_sparks_java_options(tmp_path):
    assert one_word("-Xss16m") == "-Xss16m"
    assert one_word("-Djava.io.tmpdir=/home/a/My Projects/var") == '"-Djava.io.tmpdir=/home/a/My Projects/var"'
    archive = tmp_path / "My Projects" / "spark-classes.jsa"
    archive.parent.mkdir()
    archive.write_bytes(b"\0")
    assert driver_java_options(archive).startswith(f'"-XX:SharedArchiveFile={archive}" ')


def test_the_spark_session_carries_them(spark):
    """The session every test shares starts through pipeline.runtime.spark.build_spark, as the job does,
    with the driver's JVM options."""
    from pipeline.runtime.class_archive import ARCHIVE

    jvm_arguments = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-Xss16m" in jvm_arguments
    assert not any(a.startswith("-XX:TieredStopAtLevel") for a in jvm_arguments)  # both compilers: C2 pays off
    assert (f"-XX:SharedArchiveFile={ARCHIVE}" in jvm_arguments) == ARCHIVE.is_file()
    assert "sharing" in spark._jvm.java.lang.System.getProperty("java.vm.info")
