"""nbdev 2 style setup: everything is read from settings.ini."""
from configparser import ConfigParser
import os, setuptools, shlex

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

cfg_keys = 'version description keywords author author_email'.split()
expected = cfg_keys + "lib_name user branch license status min_python audience language".split()
for o in expected: assert o in cfg, "missing expected setting: {}".format(o)
setup_cfg = {o: cfg[o] for o in cfg_keys}

# SPDX expressions: setuptools warns on every install about the licence classifiers nbdev's template adds
licenses = {'apache2': 'Apache-2.0', 'mit': 'MIT'}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable',
            '6 - Mature', '7 - Inactive']
py_versions = '3.10 3.11 3.12 3.13'.split()

requirements = shlex.split(cfg.get('requirements', ''))
# every `<name>_requirements` key is the extra `<name>` (pip install -e .[dev], .[l3], .[demo])
extras = {k[:-len('_requirements')]: shlex.split(v) for k, v in cfg.items()
          if k.endswith('_requirements') and k != 'requirements'}
min_python = cfg['min_python']
lic = licenses.get(cfg['license'].lower(), cfg['license'])

setuptools.setup(
    name=cfg['lib_name'],
    license=lic,
    classifiers=[
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    include_package_data=True,
    install_requires=requirements,
    extras_require=extras,
    dependency_links=cfg.get('dep_links', '').split(),
    python_requires='>=' + cfg['min_python'],
    long_description=open('README.md', encoding='utf-8').read() if os.path.exists('README.md') else cfg['description'],
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'nbdev': [f'{cfg.get("lib_path")}={cfg.get("lib_path")}._modidx:d']},
    **setup_cfg)
